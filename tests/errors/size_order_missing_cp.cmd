tiny --cp 2 --order tp-dp-pp
