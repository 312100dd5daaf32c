# daemon layer build fragment — see top-level Makefile
