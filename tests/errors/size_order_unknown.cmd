tiny --order tp-xp-dp-pp
