tiny --pp 2 --layout Et*4|Lt*4
