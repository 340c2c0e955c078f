"""sagebuild: build, name, verify and index SageAttention wheels from build-matrix.yaml.

Run it as ``python -m sagebuild --help`` from the checkout's root, or from any directory as
``python path/to/checkout/sagebuild --help`` or ``path/to/checkout/bin/sagebuild --help``. It is a
tool of the repository, not part of the wheels it builds. ``sagebuild.matrix`` needs only PyYAML and
packaging, so setup.py can import it.
"""
