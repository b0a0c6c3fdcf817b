tiny --cp 3
