tiny --mbs 131072
