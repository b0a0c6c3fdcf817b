tiny --pp 2 --layout Et*4L|t*4L
