"""The one accounting step around every upstream call: hold the worst case against every
budget and rate limit of a key, settle to what the call used (accountant.py), through the
budget and rate counters' Protocol (counters.py) or a share of them held in memory
(shares.py); prices (prices.py), the ledger of every call (ledger.py), and the recovery of
what a dead process left open (recovery.py). No module here names a storage backend: those
live in kairos.gateway.store and implement the Protocols declared here.
"""
