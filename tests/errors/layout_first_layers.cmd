tiny --pp 2 --layout Et*4|t*4L --first-layers 4
