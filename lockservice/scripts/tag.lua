--[[ tag: commit an idempotency tag to the lease its owner decided on (R26).
  KEYS[1..9] as acquire.lua (lock, fence, synced, quarantine, waitq, waitx, waitt,
  holders, holdert:{name})
  ARGV[1] lease_id  ARGV[2] tag  ARGV[3] the lease's decided token
  ARGV[4] the node's run_id as the caller read it when it connected
  Records "<token> <tag>" in holdert:{name} for lease_id, so that the entry goes
  with the lease's hold (released, expired, extended) — only while lease_id holds
  the lock on this node, and only when no other lease holding it committed the tag.
  Returns {1} when committed, {0} when lease_id does not hold the lock here,
  {-4, token, pttl, lease_id} when another lease holding it committed the tag,
  {-2, 0} / {-1, pttl} on a node not synced in this run / quarantined (R17). ]]
local base, code, pttl = grantable(KEYS[3], KEYS[4], ARGV[4])
if not base then
  return {code, pttl}
end
local id, tag, token = ARGV[1], ARGV[2], ARGV[3]
local current = holder(KEYS)
local found = tagged(KEYS, current, tag)
if found and found[1] ~= id then
  return {-4, found[2], found[3], found[1]}
end
local held, left = holds(KEYS, current, id)
if not held then
  return {0}
end
redis.call('HSET', KEYS[9], id, token .. ' ' .. tag)
if not group_of(current) then
  redis.call('PEXPIRE', KEYS[9], left)  -- with the exclusive hold; extend.lua keeps it
end
return {1}
