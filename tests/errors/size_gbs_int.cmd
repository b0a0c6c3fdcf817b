tiny --mbs 65536 --dp 65536
