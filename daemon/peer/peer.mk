# daemon/peer build fragment — see top-level Makefile
