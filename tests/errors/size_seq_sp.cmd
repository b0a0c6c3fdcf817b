tiny --tp 4 --sp --seq 62
