# daemon/layout build fragment — see top-level Makefile
