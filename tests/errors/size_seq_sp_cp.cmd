tiny --tp 4 --sp --cp 2 --seq 40
