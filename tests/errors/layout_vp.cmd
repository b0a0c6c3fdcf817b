tiny --pp 2 --vp 2 --layout Et*4|t*4|t*0|L
