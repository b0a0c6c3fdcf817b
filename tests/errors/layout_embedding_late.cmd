tiny --pp 2 --layout |Et*4|t*4|L
