# gpu layer build fragment — see top-level Makefile
