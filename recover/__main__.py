import sys

from recover import main

sys.exit(main())
