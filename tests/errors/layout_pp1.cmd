tiny --layout Et*4|t*4L
