tiny --seq 128
