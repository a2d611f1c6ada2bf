--[[ release: delete lock:{name} if lease_id holds it, leave the wait queue, wake the next.
  KEYS[1] lock:{name}  KEYS[2] waitq:{name}  KEYS[3] waitx:{name}
  ARGV[1] lease_id  ARGV[2] release channel  ARGV[3] name
  ARGV[5] the caller's process id (queue members are "<lease_id>@<process>")
  ARGV[4] '1' to leave the wait queue too, '0' to keep the waiter's place (undoing
          a partial grant between two tries)
  Returns 1 when deleted, 0 when the lock is absent or held by another lease.
  Publishes "<name>\n<lease_id>\n<next waiter or empty>" when the lock became free:
  on "<channel>:<process>" of the next waiter's process alone, or, with nobody
  queued, on "<channel>", which every process hears.
  Also run to undo a partial grant or to give up waiting. fence:{name} is never
  touched: the counter must outlive the lock. ]]
local id = ARGV[1]
local member = id .. '@' .. ARGV[5]
local deleted = 0
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, #id + 1) == id .. ':' then
  redis.call('DEL', KEYS[1])
  deleted = 1
end
local queued = 0
if ARGV[4] == '1' then
  queued = redis.call('ZREM', KEYS[2], member)
  redis.call('ZREM', KEYS[3], member)
end
-- An undo between two tries (ARGV[4] '0') wakes nobody: the lock was never really held.
if (deleted == 1 and ARGV[4] == '1') or (queued == 1 and not current) then
  local head = nil
  if redis.call('EXISTS', KEYS[3]) == 1 then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)
    if #dead > 0 then
      redis.call('ZREM', KEYS[3], unpack(dead))
      redis.call('ZREM', KEYS[2], unpack(dead))
    end
    head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  end
  local at = head and string.find(head, '@', 1, true)
  if at then
    redis.call('PUBLISH', ARGV[2] .. ':' .. string.sub(head, at + 1),
      ARGV[3] .. '\n' .. id .. '\n' .. string.sub(head, 1, at - 1))
  else
    redis.call('PUBLISH', ARGV[2], ARGV[3] .. '\n' .. id .. '\n')
  end
end
return deleted
