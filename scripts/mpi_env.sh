# Sourced by the scripts that start MPI jobs on this machine.
# Open MPI refuses to run as root unless told to; a fresh Debian machine is usually root.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
