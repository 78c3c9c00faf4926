"""gym-sidecar against rotel: spans/s, CPU, spans per CPU-second and RSS (``__main__``)."""
