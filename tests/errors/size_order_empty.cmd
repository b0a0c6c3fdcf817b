tiny --order tp--pp
