tiny --dump layers
