"""The map-maker's programs: ``python -m mapmaker realize | preprocess | calibrate | model | bench``.

The only wing that writes files (product folders, plan reports, calibrations)
or prints; the contract with the worker -- exit codes, file names, command
line -- is :mod:`schemas.programs`, and the file helpers :mod:`schemas.files`.
"""
