--[[ undo: give back the grant of a try that did not make a lease (R7), and hand the
  lock to the next waiter if it became free (R9).
  KEYS[1] lock:{name}   KEYS[2] fence:{name}   KEYS[3] fencegate:synced
  KEYS[4] fencegate:quarantine   KEYS[5] waitq:{name}   KEYS[6] waitx:{name}
  KEYS[7] waitt:{name}   KEYS[8] holders:{name}   KEYS[9] holdert:{name}
  ARGV[1] lease_id   ARGV[2] release channel   ARGV[3] name
  ARGV[4] the caller's process id   ARGV[5] the node's run_id as the caller read it
  ARGV[6] the waiter's ticket ('' for a try without waiting)
  ARGV[7] keepalive (ms)   ARGV[8] the waiter's ttl (ms) and kind, as waitt:{name} has it
  ARGV[9] the token of the grant to undo ('' for any grant of lease_id: a try
          without waiting). A queued waiter names the grant (R13), so an undo that
          reaches the node late (stuck in a dropped connection) cannot take a grant
          issued after it.
  Returns 0 when lease_id did not hold the lock (that grant); for a queued waiter
  the grant's token when it is kept — no earlier waiter is queued here, so a
  release handed it over and the rest of the quorum is on its way (R15) — else the
  grant is given up and minus its token returned. The waiter keeps its place.
  A grant in a group of shared or semaphore holders is undone alike (R22). ]]
local id, ticket = ARGV[1], ARGV[6]
local current = holder(KEYS)
local token
if current and string.sub(current, 1, #id + 1) == id .. ':' then
  token = tonumber(string.sub(current, #id + 2))
else
  token = member_entry(KEYS, id)
end
if not token or (ARGV[9] ~= '' and token ~= tonumber(ARGV[9])) then
  return 0
end
if ticket ~= '' then
  -- queue again with the same ticket, and see who comes first, in the queue's own
  -- order (ticket, then member), so ties break alike on every node
  local member = id .. '@' .. ARGV[4]
  local now = now_ms()
  purge(KEYS[5], KEYS[6], KEYS[7], now)
  enqueue(KEYS[5], KEYS[6], KEYS[7], member, ticket, ARGV[8], tonumber(ARGV[7]), now)
  if redis.call('ZRANGE', KEYS[5], 0, 0)[1] == member then
    dequeue(KEYS[5], KEYS[6], KEYS[7], member)
    return token
  end
end
if group_of(current) then
  redis.call('ZREM', KEYS[8], id)
  redis.call('HDEL', KEYS[9], id)
  if not purge_members(KEYS, now_ms()) then
    stretch(KEYS)
  end
else
  redis.call('DEL', KEYS[1], KEYS[9])
end
hand_over(KEYS, ARGV[2], ARGV[3], id, ARGV[5])
return -token
