--[[ release: delete lock:{name} if lease_id holds it, and wake waiters.
  KEYS[1] lock:{name}  ARGV[1] lease_id  ARGV[2] release channel  ARGV[3] name
  Returns 1 when deleted, 0 when the lock is absent or held by another lease.
  fence:{name} is never touched: the counter must outlive the lock. ]]
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
