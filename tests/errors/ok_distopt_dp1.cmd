tiny --tp 2 --dist-opt
