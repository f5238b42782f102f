"""python -m horovod_cpp.runner ... is hvdrun ..."""
import sys

from horovod_cpp.runner.launch import main

sys.exit(main())
