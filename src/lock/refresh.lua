-- Refresh: set the remaining ttl of the hold whose token is given. The lease lasts as long as its
-- longest-lived hold, so a shorter ttl never cuts another hold of the same lease short.
--
-- KEYS: the prelude's eight.
-- ARGV[1] token   ARGV[2] ttl ms (0 reuses the ttl the hold was acquired with)
-- ARGV[3] smallest ttl accepted (ms); a smaller resulting ttl changes nothing
--
-- Returns the hold's new remaining ttl in ms, -1 when the token holds nothing, or -2 when the
-- ttl would be below ARGV[3].
return refresh_hold(ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), clock())
