tiny --check --inspect
