tiny --cp 2 --seq 62
