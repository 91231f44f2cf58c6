"""Command-line entry points: `danube-broker` and `danube-cli`."""
