"""vcloud: multi-temporal satellite cloud removal on SEN12MS-CR-TS, from laptop to LUMI.

Importing the package does nothing but define the version; every heavy import happens in
the module that needs it.
"""

__version__ = "0.1.0"
