tiny --order tp-dp-tp-pp
