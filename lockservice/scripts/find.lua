--[[ find: the lease held with an idempotency tag (R26), read only.
  KEYS[1] lock:{name}  KEYS[2] fence:{name}  KEYS[3] fencegate:synced
  KEYS[4] fencegate:quarantine  KEYS[5..7] waitq, waitx, waitt:{name}
  KEYS[8] holders:{name}  KEYS[9] holdert:{name}
  ARGV[1] tag  ARGV[2] the node's run_id as the caller read it when it connected
  Returns {token, pttl, lease_id} of the lease held with the tag, {0} when none
  is, {-2} on a node not synced in this run (R17). ]]
local marker = redis.call('GET', KEYS[3])
if not marker or string.sub(marker, -#ARGV[2] - 1) ~= ' ' .. ARGV[2] then
  return {-2}
end
local current = redis.call('GET', KEYS[1])
local found = tagged(KEYS, current, ARGV[1])
if not found then
  return {0}
end
return {found[2], found[3], found[1]}
