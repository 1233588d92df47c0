"""auditlib: gradient-leakage audits for federated learning.

The library behind the dashboard and the command line. Layout follows the data flow of one
audit: ``models``/``data`` describe the victim, ``fl`` simulates what its update looks like
to the server, ``defenses`` transform that update, ``attacks`` rebuild the private batch
from what the server sees, ``metrics`` compare the result with the truth, and ``engine``
runs the whole thing.
"""

__version__ = "0.1.0"
