"""What every framework's face of horovod_cpp shares: the runtime's lifecycle and topology
(``basics``) and the process sets (``process_sets``). Imports no framework."""
