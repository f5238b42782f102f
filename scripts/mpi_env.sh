# Sourced by run.sh/test.sh: what Open MPI needs on these machines.
# Running as root (containers, CI) needs both variables; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
