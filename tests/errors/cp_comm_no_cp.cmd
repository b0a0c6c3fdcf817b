tiny --cp-comm a2a
