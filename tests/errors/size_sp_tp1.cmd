tiny --sp
