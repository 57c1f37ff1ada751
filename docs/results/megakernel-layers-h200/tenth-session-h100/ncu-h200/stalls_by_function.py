import csv, re, collections, sys
rows=list(csv.reader(open(sys.argv[1] if len(sys.argv)>1 else "source_sass.csv")))
hdr=rows[1]; rows=rows[2:]
base=int(rows[0][0],16)
funcs=[(0x181c0,'gemv_round<1>'),(0x19c20,'gemv_round<4>'),(0x1ca10,'merge_heads<16>'),(0x1f900,'merge_heads<64>'),(0x227f0,'attend_chunk<4,4>'),(0x2a1e0,'attend_chunk<8,8>'),(0x36750,'router_partials'),(0x38e00,'router_from_partials'),(0x3e3a0,'quantize<1>'),(0x3fd00,'quantize<2>'),(0x42fb0,'div_s64'),(0x43480,'rcp'),(0x437c0,'div_slowpath'),(0x43f00,'end')]
def fn(off):
    name='body'
    for a,n in funcs:
        if off>=a: name=n
    return name
stalls=[h for h in hdr[32:50]]
agg=collections.defaultdict(lambda: collections.Counter())
tot=0
for r in rows:
    off=int(r[0],16)-base; f=fn(off); s=int(r[2]); tot+=s
    agg[f]['samples']+=s; agg[f]['inst']+=int(r[5])
    for i,h in enumerate(stalls): agg[f][h]+=int(r[32+i])
print("total samples",tot)
for f,c in sorted(agg.items(), key=lambda x:-x[1]['samples']):
    if c['samples']==0: continue
    top=sorted(((c[h],h) for h in stalls), reverse=True)[:5]
    print(f"{f:22s} {c['samples']:6d} {100*c['samples']/tot:5.1f}%  inst {c['inst']:9d}  " + ", ".join(f"{h[6:]} {100*v/c['samples']:.0f}%" for v,h in top))
