tiny --tp 2 --cp 4 --cp-comm a2a
