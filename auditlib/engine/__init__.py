"""One run end to end: attacks planned and run, controls, batches, the stream, Ray and runs."""
