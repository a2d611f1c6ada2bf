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
  ARGV[7] mode: exclusive (default), shared or semaphore   ARGV[8] permits
  ARGV[9] idempotency tag ('' for none, R26)
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
                     lost or reloaded from an old snapshot, or new),
          {-3, permits} when semaphore holders of other permits hold it (R22),
          {-4, token, pttl, lease_id} when lease_id, another lease, holds it with the
                     tag committed (tag.lua; token: the decided one, R26).
  The lock value is "<lease_id>:<token>" so that the holder's token can be read back,
  or "=<mode> <permits>" for a group of shared or semaphore holders (queue.lua).
  A free lock goes to the earliest live waiter, so the releasing client cannot take
  it straight back while others wait. ]]
local base, code, pttl = grantable(KEYS[3], KEYS[4], ARGV[5])
if not base then
  return {code, pttl}
end
local id, ttl, ticket = ARGV[1], ARGV[2], ARGV[3]
local mode, permits, tag = ARGV[7] or 'exclusive', tonumber(ARGV[8] or '0'), ARGV[9] or ''
local spec = ttl
if mode ~= 'exclusive' then
  spec = ttl .. ' ' .. mode .. ' ' .. string.format('%d', permits)
end
local member = id .. '@' .. ARGV[6]
local current = holder(KEYS)
local found = tagged(KEYS, current, tag)
if found and found[1] ~= id then
  return {-4, found[2], found[3], found[1]}
end
if current then
  if string.sub(current, 1, #id + 1) == id .. ':' then
    -- handed over meanwhile: issued anew (R12), without a tag (a grant has none)
    redis.call('DEL', KEYS[9])
    return {grant(KEYS, base, id, ttl, mode, permits), 0}
  elseif group_of(current) and member_entry(KEYS, id) then
    return {grant(KEYS, base, id, ttl, mode, permits), 0}  -- the same in a group
  end
end
local may, held_permits = joinable(current, mode, permits, KEYS)
if may == 'mismatch' then
  return {-3, held_permits}
end
if may and redis.call('EXISTS', KEYS[6]) == 1 then
  local now = now_ms()
  purge(KEYS[5], KEYS[6], KEYS[7], now)
  -- Join first (NX keeps an earlier place), then look: a waiter this node had not
  -- seen yet (it restarted, or missed an enqueue) takes its place by its ticket now,
  -- as on the other nodes, instead of waiting a retry behind later waiters.
  if ticket ~= '' then
    enqueue(KEYS[5], KEYS[6], KEYS[7], member, ticket, spec, tonumber(ARGV[4]), now)
  end
  local head = redis.call('ZRANGE', KEYS[5], 0, 0)[1]
  if head and head ~= member then
    return {0, 0, counter(KEYS[2])}  -- R25: earlier waiters first
  end
  dequeue(KEYS[5], KEYS[6], KEYS[7], member)
end
if not may then
  if ticket ~= '' then
    enqueue(KEYS[5], KEYS[6], KEYS[7], member, ticket, spec, tonumber(ARGV[4]), now_ms())
  end
  local left = redis.call('PTTL', KEYS[1])
  if mode == 'semaphore' and group_of(current) == 'semaphore' then
    local first = redis.call('ZRANGE', KEYS[8], 0, 0, 'WITHSCORES')[2]
    if first then
      left = math.max(1, tonumber(first) - now_ms())  -- the first permit to come free
    end
  end
  return {0, left, counter(KEYS[2])}
end
return {grant(KEYS, base, id, ttl, mode, permits), 0}
