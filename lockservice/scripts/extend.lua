--[[ extend: push back the expiry of lock:{name} if lease_id still holds it (R6).
  KEYS[1] lock:{name}  ARGV[1] lease_id  ARGV[2] ttl (ms)
  Returns the lease's token when extended, 0 when the lock is absent or held by
  another lease. Never re-creates an expired lock: that would hand a lost lease
  back silently. ]]
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(string.sub(current, #ARGV[1] + 2))
end
return 0
