"""What every memflow process shares, by concern: the store and its engines (storage), every write to
it (writer), the Redis database (redisdb), the stages' streams (streaming), what is said but not stored yet
(unstored), a search's adapters (search), the models (inference), the client and its calls (sdk), the changes
feed (changes), the front doors' admission (admission) and monitoring (monitoring); and, at the top, what all
of them use: settings, errors, the wire codec and polling."""
