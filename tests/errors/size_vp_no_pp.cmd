tiny --vp 2
