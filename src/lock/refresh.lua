-- Refresh: set the remaining ttl of the lease (exclusive or shared) whose token is given.
--
-- KEYS: state, then readers, shared (see the prelude; callers of the first version pass only the
-- state key).
-- ARGV[1] token   ARGV[2] ttl ms (0 reuses the ttl the lease was acquired with)
-- ARGV[3] smallest ttl accepted (ms); a smaller resulting ttl changes nothing
--
-- Returns the new remaining ttl in ms, -1 when the token does not hold the lock, or -2 when the
-- ttl would be below ARGV[3].
local K = lock_keys({'state', 'readers', 'shared'})
return refresh_lease(K, ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]))
