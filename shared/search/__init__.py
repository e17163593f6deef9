"""What a search needs beside its pure recipe in pipeline/: the reader that hands it
the store, the encoders and the second look (reader.py), the pending memories it adds from the read-your-writes
layer (pending.py), and searches first in a process that also runs maintenance jobs (foreground.py)."""
