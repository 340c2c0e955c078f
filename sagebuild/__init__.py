"""sagebuild: build, name, verify and index SageAttention wheels from build-matrix.yaml.

Run it as ``python -m sagebuild --help`` from a checkout. It is a tool of the repository, not part of
the wheels it builds. ``sagebuild.matrix`` needs only PyYAML and packaging, so setup.py can import it.
"""
