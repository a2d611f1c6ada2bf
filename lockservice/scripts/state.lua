--[[ state: whether this node can grant now (readiness; R17, R19).
  KEYS[1] fencegate:synced   KEYS[2] fencegate:quarantine
  ARGV[1] the node's run_id as the caller read it when it connected
  Returns {1, 0} when it can grant, {-1, pttl} when quarantined for pttl more ms,
  {-2, 0} when it has not been synced in this run. ]]
local base, code, pttl = grantable(KEYS[1], KEYS[2], ARGV[1])
if base then
  return {1, 0}
end
return {code, pttl}
