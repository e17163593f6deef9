"""What every memflow process shares: settings, codec, streams, store adapters, embedder, client."""
