#!/bin/sh
# A stand-in for mpirun (ddprun --mpirun): says it is Open MPI's, then prints the interface
# variables the ranks would get.
[ "$1" != --version ] || { echo "mpirun (Open MPI) 4.1.4"; exit 0; }
env | grep '_SOCKET_IFNAME=' | sort
