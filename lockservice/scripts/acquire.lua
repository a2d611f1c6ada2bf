--[[ acquire: take lock:{name} for lease_id and issue the next token (R1, R8, R12, R17).
  KEYS[1] lock:{name}   KEYS[2] fence:{name}   KEYS[3] fencegate:synced
  KEYS[4] fencegate:quarantine   KEYS[5] waitq:{name}   KEYS[6] waitx:{name}
  KEYS[7] waitt:{name}
  ARGV[1] lease_id   ARGV[2] ttl (ms)
  ARGV[3] ticket: '' for a try without waiting, else the waiter's arrival time
          (the same number on every node, so every node orders waiters alike)
  ARGV[4] keepalive (ms): a queued waiter that does not try again within it is dropped
  ARGV[5] the node's run_id as the caller read it when it connected
  ARGV[6] the caller's process id: a release hands the lock to the next waiter
          and tells that waiter's process alone
  Returns {token, 0} when granted (token > 0) — also when a release already handed
                     the lock to this waiter: then the grant is issued anew (a new
                     token, ttl from now), so that an undo naming the old grant, sent
                     before this try and delivered late, finds nothing to undo,
          {0, pttl, counter}  when another lease holds it or an earlier waiter is
                     queued (pttl: the holder's remaining ms, 0 when only queued
                     behind; counter: fence:{name} now, so that the waiter can tell a
                     hand-over message from before this answer, which no longer holds),
          {-1, pttl} when this node is quarantined after a restart,
          {-2, 0}    when this node has not been synced in this run (restarted, data
                     lost or reloaded from an old snapshot, or new).
  The lock value is "<lease_id>:<token>" so that the holder's token can be read back.
  A free lock goes to the earliest live waiter, so the releasing client cannot take
  it straight back while others wait. ]]
local base, code, pttl = grantable(KEYS[3], KEYS[4], ARGV[5])
if not base then
  return {code, pttl}
end
local id, ttl, ticket = ARGV[1], ARGV[2], ARGV[3]
local member = id .. '@' .. ARGV[6]
local current = redis.call('GET', KEYS[1])
if current then
  if string.sub(current, 1, #id + 1) == id .. ':' then
    return {grant(KEYS[1], KEYS[2], base, id, ttl), 0}  -- handed over meanwhile
  end
  if ticket ~= '' then
    enqueue(KEYS[5], KEYS[6], KEYS[7], member, ticket, ttl, tonumber(ARGV[4]), now_ms())
  end
  return {0, redis.call('PTTL', KEYS[1]), counter(KEYS[2])}
end
if redis.call('EXISTS', KEYS[6]) == 1 then
  local now = now_ms()
  purge(KEYS[5], KEYS[6], KEYS[7], now)
  -- Join first (NX keeps an earlier place), then look: a waiter this node had not
  -- seen yet (it restarted, or missed an enqueue) takes its place by its ticket now,
  -- as on the other nodes, instead of waiting a retry behind later waiters.
  if ticket ~= '' then
    enqueue(KEYS[5], KEYS[6], KEYS[7], member, ticket, ttl, tonumber(ARGV[4]), now)
  end
  local head = redis.call('ZRANGE', KEYS[5], 0, 0)[1]
  if head and head ~= member then
    return {0, 0, counter(KEYS[2])}
  end
  dequeue(KEYS[5], KEYS[6], KEYS[7], member)
end
return {grant(KEYS[1], KEYS[2], base, id, ttl), 0}
