tiny --cp 2 --cp-comm ring
