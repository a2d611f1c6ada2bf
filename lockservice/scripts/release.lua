--[[ release: free lock:{name} if lease_id holds it, and hand it to the next waiter.
  KEYS[1] lock:{name}   KEYS[2] fence:{name}   KEYS[3] fencegate:synced
  KEYS[4] fencegate:quarantine   KEYS[5] waitq:{name}   KEYS[6] waitx:{name}
  KEYS[7] waitt:{name}
  ARGV[1] lease_id   ARGV[2] release channel   ARGV[3] name
  ARGV[4] '1': release, and leave the wait queue;
          '0': undo a partial grant of a try that failed (the waiter keeps its place)
  ARGV[5] the caller's process id   ARGV[6] the node's run_id as the caller read it
  ARGV[7] the undoing waiter's ticket ('' for a try without waiting)
  ARGV[8] keepalive (ms)   ARGV[9] the undoing waiter's ttl (ms)
  ARGV[10] for an undo: the token of the grant to undo ('' for any grant of
          lease_id: a try without waiting). A queued waiter names the grant, so an
          undo that reaches the node late (stuck in a dropped connection) cannot
          take a grant issued after it.
  Returns, for a release: 1 when deleted, 0 when the lock is absent or held by
  another lease. For an undo: 0 when lease_id did not hold the lock; a queued
  waiter keeps a grant that no earlier waiter is queued for (a release handed it
  over, and the rest of the quorum is on its way) and gets its token back; else
  the grant is given up and minus its token returned.
  Hand-over: when the lock becomes free and a live waiter is queued, the earliest
  gets it here, as acquire.lua would grant it, for the ttl it asked, and
  "<name>\n<released lease>\n<waiter>\n<token>" is published on
  "<channel>:<waiter's process>". A node that cannot grant (unsynced, quarantined)
  publishes "<name>\n<released lease>\n<waiter>" there instead: a wake-up to try.
  Nobody queued: nothing is published. fence:{name} only ever grows. ]]
local id, ticket = ARGV[1], ARGV[7]
local member = id .. '@' .. ARGV[5]
local current = redis.call('GET', KEYS[1])
local freed = false
local result = 0
local owned
if ARGV[4] == '0' and ARGV[10] ~= '' then
  owned = current == id .. ':' .. ARGV[10]
else
  owned = current and string.sub(current, 1, #id + 1) == id .. ':'
end
if owned then
  local token = tonumber(string.sub(current, #id + 2))
  result = 1
  if ARGV[4] == '0' and ticket ~= '' then
    -- queue again with the same ticket, and see who comes first, in the queue's own
    -- order (ticket, then member), so ties break alike on every node
    local now = now_ms()
    purge(KEYS[5], KEYS[6], KEYS[7], now)
    enqueue(KEYS[5], KEYS[6], KEYS[7], member, ticket, ARGV[9], tonumber(ARGV[8]), now)
    if redis.call('ZRANGE', KEYS[5], 0, 0)[1] == member then
      dequeue(KEYS[5], KEYS[6], KEYS[7], member)
      return token
    end
    result = -token  -- an earlier waiter is queued here: it gets the lock
  elseif ARGV[4] == '0' then
    result = -token
  end
  redis.call('DEL', KEYS[1])
  freed = true
end
if ARGV[4] == '1' and dequeue(KEYS[5], KEYS[6], KEYS[7], member) == 1 and not current then
  freed = true  -- this waiter may have been the head that the others waited for
end
if not freed or redis.call('EXISTS', KEYS[6]) == 0 then
  return result
end
purge(KEYS[5], KEYS[6], KEYS[7], now_ms())
local head = redis.call('ZRANGE', KEYS[5], 0, 0)[1]
if not head then
  return result
end
local at = string.find(head, '@', 1, true)
if not at then
  return result  -- not a member this version queued
end
local waiter = string.sub(head, 1, at - 1)
local message = ARGV[3] .. '\n' .. id .. '\n' .. waiter
local ttl = redis.call('HGET', KEYS[7], head)
local base = ttl and grantable(KEYS[3], KEYS[4], ARGV[6])
if base then
  dequeue(KEYS[5], KEYS[6], KEYS[7], head)
  message = message .. '\n' .. string.format('%d', grant(KEYS[1], KEYS[2], base, waiter, ttl))
end
redis.call('PUBLISH', ARGV[2] .. ':' .. string.sub(head, at + 1), message)
return result
