--[[ release: free lock:{name} if lease_id holds it (R6), or its place in a group of
  shared or semaphore holders (R22), leave the wait queue, and hand the lock (or the
  permit) to the next waiters (R9, R25, queue.lua: hand_over).
  KEYS[1] lock:{name}   KEYS[2] fence:{name}   KEYS[3] fencegate:synced
  KEYS[4] fencegate:quarantine   KEYS[5] waitq:{name}   KEYS[6] waitx:{name}
  KEYS[7] waitt:{name}   KEYS[8] holders:{name}   KEYS[9] holdert:{name}
  ARGV[1] lease_id   ARGV[2] release channel   ARGV[3] name
  ARGV[4] the caller's process id   ARGV[5] the node's run_id as the caller read it
  Returns 1 when deleted, 0 when the lock is absent or held by another lease.
  fence:{name} is never touched (R2). ]]
local id = ARGV[1]
local current = holder(KEYS)
local freed = false
local result = 0
if current and string.sub(current, 1, #id + 1) == id .. ':' then
  redis.call('DEL', KEYS[1], KEYS[9])
  freed = true
  result = 1
elseif member_entry(KEYS, id) then
  redis.call('ZREM', KEYS[8], id)
  redis.call('HDEL', KEYS[9], id)
  if not purge_members(KEYS, now_ms()) then
    stretch(KEYS)
  end
  freed = true  -- a permit, or the lock when it was the last member
  result = 1
end
-- waitq, waitx and waitt:{name} hold the same members and are written and expire
-- together: without waitx:{name} nobody is queued, neither this lease nor a waiter
-- to hand over to (the common case: one command tells)
local queued = redis.call('EXISTS', KEYS[6]) == 1
if queued and dequeue(KEYS[5], KEYS[6], KEYS[7], id .. '@' .. ARGV[4]) == 1
    and (not current or group_of(current)) then
  -- this waiter may have been the head that the others waited for: the lock is free,
  -- or a group holds it that the next head may join (an exclusive waiter leaving
  -- before shared or semaphore waiters)
  freed = true
end
if freed and queued then
  hand_over(KEYS, ARGV[2], ARGV[3], id, ARGV[5])
end
return result
